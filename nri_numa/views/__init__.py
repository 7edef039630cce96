"""What the command line shows a person, each a view and its renderer side by side: a pods file
run through the engine (simulate), one pod's hints and merge (explain), and the ledger on disk
against the cgroups (state)."""

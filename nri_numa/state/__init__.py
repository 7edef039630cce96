"""What nri-numa holds between decisions: the ledger (and, with the plugin, its checkpoint)."""

from nri_numa.state.ledger import Ledger, LedgerError, LedgerReader

__all__ = ["Ledger", "LedgerError", "LedgerReader"]

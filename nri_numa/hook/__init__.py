"""The OCI hook front door (``nri-numa hook STAGE``): runc and crun run it from config.json,
podman and CRI-O from a hooks.d file. Each run is a short-lived process: it reads the OCI state
or spec, decides with the engine against the ledger every hook process shares, and writes the
container's cpuset (createRuntime) or its spec (podman's precreate). See docs/oci-hook.md.

Nothing is imported here: a hook process loads only what its stage needs.
"""

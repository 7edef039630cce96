"""What the long-running parts of nri-numa share: their settings (the ``nriNuma:`` map and
flags), the files a person hands them (configuration, captured topology), logs and metrics."""

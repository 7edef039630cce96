"""NRI wire layer: the connection multiplexer and ttrpc on top of it."""

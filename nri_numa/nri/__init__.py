"""NRI front door: the wire layer (mux, ttrpc), the session API and the plugin."""

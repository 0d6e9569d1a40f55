"""conformance: the suite a chip vendor runs against its plugin."""

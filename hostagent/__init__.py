"""modelcast host agent: reliable chunked multicast transfer of model files."""

"""Where rules come from: rule files with hot reload, or an xDS control plane."""

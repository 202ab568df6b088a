"""Building the Mojo kernels into extension modules (CPU and GPU), cached by source hash and target CPU."""

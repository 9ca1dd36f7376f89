"""TPU VMs behind one small interface, so a backend other than the Cloud TPU API can be added."""

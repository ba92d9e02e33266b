"""Monitoring: the GPU exporter that the monitoring role runs beside Prometheus and the node exporter."""

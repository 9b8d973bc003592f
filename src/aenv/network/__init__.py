"""Per-sandbox network namespaces ("slots"), addressing, NAT and egress policy."""

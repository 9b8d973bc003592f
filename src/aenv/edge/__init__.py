"""The HTTP edge the node API, the proxy and the gateway share: the guarded connection
protocol, body limits, and every E2B error body."""

"""The reverse proxy to sandbox ports: header and host routing, HTTP streaming, WebSockets."""

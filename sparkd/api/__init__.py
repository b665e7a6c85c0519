"""The control API: HTTP with JSON over the daemon's unix socket (sparkctl), and later its TCP port."""

"""What the daemon shows, reading and never writing the node: the status and the STATUS= line (``status``),
``/metrics`` (``metrics``), the flight recorder's records (``recorder``) and the commands' port (``control``)."""

"""The loop: the one queue of observations and the one writer of the node's state (``supervisor``), what the
lifecycle remembers across daemon restarts (``remembered``), and the task group the parts' work runs in."""

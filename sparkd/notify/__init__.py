"""Notifications without a monitoring stack: webhooks told at once (issue 40).

:mod:`.events` (what a change of state means, pure), :mod:`.shapes` (an event as each webhook takes it, pure),
:mod:`.limits` (the rate limit, what it held back, the retry schedule, pure), :mod:`.sender` (the
:class:`~sparkd.notify.sender.Notifier`: a bounded queue per target, drained by its own task).
"""

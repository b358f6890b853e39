"""Notifications, the side effects: the user's private files (preferences,
the delivery log), the channels (terminals, mail, webhooks) and the
deliverer loop.  The rules of which event is due when are pure
(``bk.core.notify``); what the ledger and the monitor say comes from the
service layer (``bk.service.notify``), which runs all of this as the user.
"""

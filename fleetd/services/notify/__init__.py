"""What happened, and who hears of it.

- ``events``           the audit trail of state changes and their actors
- ``webhooks``         receivers, the outbox and its sender
- ``webhook_targets``  where a webhook may post
- ``feed``             each owner's notifications: its jobs' ends, its team's budget alerts
"""

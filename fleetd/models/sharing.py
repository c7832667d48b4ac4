"""What a job's owner shows others: read-only share links to a job, and each owner's feed of
notifications (jobs that ended, budget alerts)."""

import peewee

from fleetd.models.base import BaseModel


class Share(BaseModel):
    """A read-only link to one job (GET /api/share/{token}); only the SHA-256 of its token is kept,
    so the link is shown once, when it is made."""

    id = peewee.CharField(primary_key=True, max_length=32)
    token_hash = peewee.CharField(max_length=64, unique=True)
    job_id = peewee.CharField(max_length=32, index=True)
    created_by = peewee.CharField(max_length=200)  # the principal's label (user:alice)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(null=True)  # null: until it is revoked
    revoked_at = peewee.DateTimeField(null=True)


class Notification(BaseModel):
    """One entry of an owner's feed (GET /api/v1/me/notifications). `owner_id` is the owner id of
    work (Principal.owner_id: a user's id, or a service account's own token id), so a job's end
    notifies its owner without a lookup."""

    id = peewee.AutoField()
    owner_id = peewee.CharField(max_length=32)
    at = peewee.DateTimeField(index=True)
    kind = peewee.CharField(max_length=32)  # job.succeeded, job.failed, job.cancelled, budget...
    subject_kind = peewee.CharField(max_length=16)  # job or team
    subject_id = peewee.CharField(max_length=200)
    subject_name = peewee.CharField(max_length=200)
    text = peewee.TextField()
    read = peewee.BooleanField(default=False)

    class Meta:
        indexes = ((("owner_id", "id"), False),)

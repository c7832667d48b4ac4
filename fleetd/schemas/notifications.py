"""Schemas of a user's notification feed."""

from marshmallow import Schema, fields, pre_dump

from fleetd.schemas.common import Int, PageQuerySchema, Time, page_schema


class NotificationQuerySchema(PageQuerySchema):
    after = Int(
        maximum=2**62,
        load_default=None,
        strict=False,
        metadata={"description": "only notifications with a greater id (the last one seen)"},
    )


class NotificationSubjectSchema(Schema):
    kind = fields.String(metadata={"enum": ["job", "team"]})
    id = fields.String()
    name = fields.String()


class NotificationSchema(Schema):
    id = fields.Integer()
    at = Time()
    kind = fields.String(
        metadata={
            "description": "job.succeeded, job.failed, job.cancelled or budget.threshold",
        }
    )
    subject = fields.Nested(NotificationSubjectSchema)
    text = fields.String()
    read = fields.Boolean()

    @pre_dump
    def _with_subject(self, row, **kwargs):
        """A stored notification as the API shows it: its subject as one object."""
        return {
            "id": row.id,
            "at": row.at,
            "kind": row.kind,
            "subject": {"kind": row.subject_kind, "id": row.subject_id, "name": row.subject_name},
            "text": row.text,
            "read": row.read,
        }


NotificationPageSchema = page_schema(NotificationSchema, "NotificationPage")


class NotificationReadSchema(Schema):
    up_to = Int(
        required=True,
        maximum=2**62,
        metadata={"description": "mark this notification and every earlier one read"},
    )


class NotificationReadResultSchema(Schema):
    marked = fields.Integer(metadata={"description": "how many were unread until now"})

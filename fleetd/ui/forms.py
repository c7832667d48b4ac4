"""HTML forms validated with the API's own marshmallow schemas, so both accept the same input."""

from marshmallow import ValidationError, fields

from fleetd.errors import InvalidRequest


class FormError(InvalidRequest):
    """A form that did not validate: a message per field, shown beside the form."""

    def __init__(self, errors):
        self.errors = {k: v if isinstance(v, list) else [str(v)] for k, v in errors.items()}
        text = "; ".join(f"{k}: {' '.join(str(m) for m in v)}" for k, v in self.errors.items())
        super().__init__(f"please correct the form: {text}", {"fields": self.errors})


def _convert(field, raw):
    """Text from a form -> the type the schema field expects (bad text is left for it to refuse)."""
    raw = raw.strip()
    if raw == "":
        return None
    if isinstance(field, fields.Integer):
        try:
            return int(raw)
        except ValueError:
            return raw
    if isinstance(field, fields.Float):
        try:
            return float(raw)
        except ValueError:
            return raw
    if isinstance(
        field, fields.Number
    ):  # a number of either kind (a GPU count: 2, or 0.5 of one GPU)
        return parse_number(raw)
    return raw


def parse_number(raw):
    """Text -> int, else float; text that is neither is returned as it is, for the schema to
    refuse."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


def load_form(schema, form, multipliers=None):
    """Validate `form` (a MultiDict) with `schema`; raise FormError with per-field messages.

    Empty inputs are left out so the schema's defaults apply. `multipliers` turn a unit the
    form asks for into the schema's (e.g. {"ttl_seconds": 3600} for a field asked in hours).
    """
    multipliers = multipliers or {}
    data = {}
    for name, field in schema.fields.items():
        if name not in form:
            continue
        raw = form.get(name, "")
        factor = multipliers.get(name)
        if factor is not None and raw.strip():
            try:
                value = float(raw) * factor
            except ValueError:
                value = raw.strip()
            else:
                value = int(value) if value.is_integer() else value
        else:
            value = _convert(field, raw)
        if value is None:
            continue
        data[name] = value
    try:
        return schema.load(data)
    except ValidationError as exc:
        raise FormError(exc.messages) from None

from rest_framework import serializers


def _is_text(field, value) -> bool:
    """False for a text field (or a list of them) given another JSON type."""
    if isinstance(field, serializers.CharField):
        return isinstance(value, str) or (value is None and field.allow_null)
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        return all(_is_text(field.child, item) for item in value)
    return True


class StrictSerializer(serializers.Serializer):
    """Rejects fields the endpoint does not know, instead of silently ignoring them, and
    text given as another JSON type."""

    requires_a_field = False  # True: a body without any field is refused (minProperties)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(set(data) - writable)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            # A text field takes text: DRF would turn a number into its digits.
            not_text = sorted(
                name for name, value in data.items() if not _is_text(self.fields.get(name), value)
            )
            if not_text:
                raise serializers.ValidationError({name: ["Not a string."] for name in not_text})
        return super().to_internal_value(data)


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    pass

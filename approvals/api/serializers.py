from rest_framework import serializers

from approvals.services import DECISIONS
from quor.lib.serializers import StrictSerializer


class ApprovalActionSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    policy = serializers.CharField()


class ApprovalSerializer(serializers.Serializer):
    """The shape of `approvals.services.approval_payload` (also in session events)."""

    id = serializers.UUIDField()
    session = serializers.UUIDField()
    app = serializers.CharField()
    actions = ApprovalActionSerializer(many=True)
    method = serializers.CharField()
    url = serializers.CharField(help_text="Query string values masked.")
    summary = serializers.CharField()
    body_preview = serializers.CharField(
        help_text="The start of the request's body as text (at most 2000 characters); "
        "empty without a body."
    )
    status = serializers.CharField()
    decided_via = serializers.CharField()
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True)


class DecisionSerializer(StrictSerializer):
    decision = serializers.ChoiceField(choices=list(DECISIONS))

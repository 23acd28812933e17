from rest_framework import serializers

from quor.selectors import make_model_id
from sandboxes.models import Sandbox, Session


class SessionSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = ["id", "title", "model", "status", "created_at", "updated_at", "finished_at"]
        read_only_fields = fields

    def get_model(self, session) -> str:
        return make_model_id(session.model_provider_id, session.model_name)


class SandboxSerializer(serializers.ModelSerializer):
    class Meta:
        model = Sandbox
        fields = [
            "id",
            "state",
            "failure_reason",
            "network_policy",
            "image_ref",
            "last_activity_at",
        ]
        read_only_fields = fields

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from knowledge.extraction import CONTENT_TYPES
from knowledge.models import KnowledgeDocument, KnowledgeSource
from knowledge.search import MAX_LIMIT, MAX_QUERY_CHARS, MAX_SOURCE_FILTERS
from quor.lib.serializers import StrictSerializer


@extend_schema_field(
    {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_QUERY_CHARS,
        # Not only spaces, and no control characters (knowledge.invalid_query).
        "pattern": "^[^\\x00-\\x1f]*[^\\s\\x00-\\x1f][^\\x00-\\x1f]*$",
    }
)
class QueryField(serializers.CharField):
    """Checked again by knowledge.search (`knowledge.invalid_query`)."""


class SearchRequestSerializer(StrictSerializer):
    query = QueryField(max_length=MAX_QUERY_CHARS, trim_whitespace=True)
    sources = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, max_length=MAX_SOURCE_FILTERS
    )
    types = serializers.ListField(
        child=serializers.ChoiceField(choices=CONTENT_TYPES), required=False, max_length=10
    )
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=10)


class SearchResultSerializer(serializers.Serializer):
    document = serializers.IntegerField(source="document_id")
    title = serializers.CharField()
    url = serializers.CharField()
    passage = serializers.CharField()
    source = serializers.IntegerField(source="source_id")
    source_name = serializers.CharField()
    type = serializers.CharField(source="content_type")
    updated_at = serializers.DateTimeField(allow_null=True)


class SearchResponseSerializer(serializers.Serializer):
    results = SearchResultSerializer(many=True)


class SourceSerializer(serializers.ModelSerializer):
    class Meta:
        model = KnowledgeSource
        fields = ["id", "name", "kind"]


class SourceAdminSerializer(serializers.ModelSerializer):
    class Meta:
        model = KnowledgeSource
        fields = [
            "id", "name", "kind", "location", "default_access", "sync_state", "sync_error",
            "synced_at", "created_at",
        ]  # fmt: skip


class SourceCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(
        choices=KnowledgeSource.Kind.choices, default=KnowledgeSource.Kind.UPLOAD
    )
    location = serializers.CharField(max_length=1000, default="", allow_blank=True)
    default_access = serializers.ListField(
        child=serializers.CharField(max_length=100), max_length=1000, default=list
    )


class DocumentSerializer(serializers.ModelSerializer):
    type = serializers.CharField(source="content_type")

    class Meta:
        model = KnowledgeDocument
        fields = [
            "id", "source", "external_id", "title", "url", "type", "size", "content_sha256",
            "source_updated_at", "access", "access_changed_at", "state", "error", "created_at",
        ]  # fmt: skip


class DocumentUploadSerializer(serializers.Serializer):
    file = serializers.FileField()
    title = serializers.CharField(max_length=500, required=False, allow_blank=True)


class AccessSerializer(serializers.Serializer):
    access = serializers.ListField(child=serializers.CharField(max_length=100), max_length=1000)

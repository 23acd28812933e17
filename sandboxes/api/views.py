from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from sandboxes import selectors
from sandboxes.api.serializers import SandboxSerializer, SessionSerializer

SESSION_ID = OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)


@extend_schema_view(retrieve=extend_schema(parameters=[SESSION_ID]))
class SessionViewSet(viewsets.ViewSet):
    serializer_class = SessionSerializer

    def list(self, request):
        return Response(SessionSerializer(selectors.sessions_of(request.user), many=True).data)

    def retrieve(self, request, pk=None):
        session = selectors.get_session_for_user(request.user, pk)
        return Response(SessionSerializer(session).data)


class MySandboxView(APIView):
    @extend_schema(responses=SandboxSerializer)
    def get(self, request):
        return Response(SandboxSerializer(selectors.get_sandbox_for_user(request.user)).data)

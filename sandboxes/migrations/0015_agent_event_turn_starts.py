# Built concurrently: a plain CREATE INDEX would block every event insert for the build.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sandboxes", "0014_sandbox_runtime_key_unique"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="agentevent",
            index=models.Index(
                condition=models.Q(("kind", "session_started")),
                fields=["session", "seq"],
                name="agent_event_turn_starts",
            ),
        ),
    ]

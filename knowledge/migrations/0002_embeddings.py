import django.db.models.deletion
import pgvector.django.indexes
import pgvector.django.vector
from django.db import migrations, models

# Passages made before embeddings keep answering full-text searches: they get the copies
# of their document's organization, source and type here, and their documents wait to be
# indexed again (the periodic requeue_stuck_documents sends them), which embeds them.
COPY_DOCUMENT_FIELDS = """
UPDATE knowledge_knowledgechunk AS chunk
   SET organization_id = source.organization_id,
       source_id = document.source_id,
       content_type = document.content_type
  FROM knowledge_knowledgedocument AS document
  JOIN knowledge_knowledgesource AS source ON source.id = document.source_id
 WHERE document.id = chunk.document_id;
UPDATE knowledge_knowledgedocument
   SET state = 'pending', indexed_sha256 = ''
 WHERE state = 'indexed';
SET CONSTRAINTS ALL IMMEDIATE;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('knowledge', '0001_initial'),
        ('quor', '0004_file_store_identity'),
    ]

    operations = [
        # A no-op where the superuser made it already, as pgvector is not trusted (README);
        # going back leaves it, as it is the superuser's.
        migrations.RunSQL("CREATE EXTENSION IF NOT EXISTS vector", migrations.RunSQL.noop),
        migrations.AddField(
            model_name='knowledgechunk',
            name='organization',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='quor.organization'),
        ),
        migrations.AddField(
            model_name='knowledgechunk',
            name='source',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='knowledge.knowledgesource'),
        ),
        migrations.AddField(
            model_name='knowledgechunk',
            name='content_type',
            field=models.CharField(max_length=20, null=True),
        ),
        migrations.RunSQL(COPY_DOCUMENT_FIELDS, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='knowledgechunk',
            name='organization',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='quor.organization'),
        ),
        migrations.AlterField(
            model_name='knowledgechunk',
            name='source',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='knowledge.knowledgesource'),
        ),
        migrations.AlterField(
            model_name='knowledgechunk',
            name='content_type',
            field=models.CharField(max_length=20),
        ),
        migrations.AddField(
            model_name='knowledgechunk',
            name='embedding',
            field=pgvector.django.vector.VectorField(dimensions=384, null=True),
        ),
        migrations.AddField(
            model_name='knowledgechunk',
            name='embedding_model',
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.AddIndex(
            model_name='knowledgechunk',
            index=pgvector.django.indexes.HnswIndex(ef_construction=200, fields=['embedding'], m=16, name='knowledge_chunk_embedding', opclasses=['vector_cosine_ops']),
        ),
    ]

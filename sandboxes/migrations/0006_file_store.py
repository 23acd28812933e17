import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('quor', '0003_stored_blob'),
        ('sandboxes', '0005_session_sharing'),
    ]

    operations = [
        migrations.CreateModel(
            name='Attachment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=255)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('blob', models.ForeignKey(editable=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='quor.storedblob')),
                ('session', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attachments', to='sandboxes.session')),
            ],
            options={
                'ordering': ['session', 'created_at', 'pk'],
            },
        ),
        # So that 0008 can be reversed: the column comes back empty, 0007 fills it.
        migrations.AlterField(
            model_name='libraryfile',
            name='content',
            field=models.BinaryField(default=b''),
        ),
        migrations.AddField(
            model_name='libraryfile',
            name='blob',
            field=models.ForeignKey(editable=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='quor.storedblob'),
        ),
        migrations.AddField(
            model_name='skill',
            name='bundle',
            field=models.ForeignKey(blank=True, editable=False, help_text='Its files: a tar archive in the file store (none: no files).', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='quor.storedblob'),
        ),
    ]

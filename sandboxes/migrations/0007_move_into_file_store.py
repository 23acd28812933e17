"""Library file contents and Skill files move from their rows into the file store."""

from dataclasses import asdict

from django.db import migrations

from quor import filestore
from sandboxes.skills import bundle_pack, bundle_unpack


def forwards(apps, schema_editor):
    StoredBlob = apps.get_model("quor", "StoredBlob")
    LibraryFile = apps.get_model("sandboxes", "LibraryFile")
    Skill = apps.get_model("sandboxes", "Skill")

    def put(data: bytes):
        return StoredBlob.objects.create(**asdict(filestore.blob_write_object(data)))

    for item in LibraryFile.objects.filter(blob__isnull=True).iterator():
        item.blob = put(bytes(item.content))
        item.save(update_fields=["blob"])
    for skill in Skill.objects.filter(bundle__isnull=True).exclude(files={}).iterator():
        files = {path: str(text).encode() for path, text in skill.files.items()}
        skill.bundle = put(bundle_pack(files))
        skill.save(update_fields=["bundle"])


def backwards(apps, schema_editor):
    LibraryFile = apps.get_model("sandboxes", "LibraryFile")
    Skill = apps.get_model("sandboxes", "Skill")
    for item in LibraryFile.objects.select_related("blob").iterator():
        item.content = filestore.blob_read(item.blob)
        item.save(update_fields=["content"])
    for skill in Skill.objects.filter(bundle__isnull=False).select_related("bundle").iterator():
        files = bundle_unpack(filestore.blob_read(skill.bundle))
        skill.files = {path: data.decode() for path, data in files.items()}
        skill.save(update_fields=["files"])


class Migration(migrations.Migration):

    dependencies = [
        ('sandboxes', '0006_file_store'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]

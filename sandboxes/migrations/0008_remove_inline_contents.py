import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sandboxes', '0007_move_into_file_store'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='libraryfile',
            name='content',
        ),
        migrations.RemoveField(
            model_name='skill',
            name='files',
        ),
        migrations.AlterField(
            model_name='libraryfile',
            name='blob',
            field=models.ForeignKey(editable=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='quor.storedblob'),
        ),
    ]

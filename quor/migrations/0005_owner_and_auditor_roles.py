from django.db import migrations, models


def make_first_admin_owner(apps, schema_editor):
    """Each organization gets an owner: its earliest admin (none if it has no admin)."""
    Membership = apps.get_model("quor", "Membership")
    organizations = Membership.objects.values_list("organization_id", flat=True).distinct()
    for organization_id in organizations:
        first_admin = (
            Membership.objects.filter(organization_id=organization_id, role="admin")
            .order_by("created_at", "pk")
            .first()
        )
        if first_admin is not None:
            Membership.objects.filter(pk=first_admin.pk).update(role="owner")


def owners_back_to_admins(apps, schema_editor):
    Membership = apps.get_model("quor", "Membership")
    Membership.objects.filter(role="owner").update(role="admin")
    Membership.objects.filter(role="auditor").update(role="member")


class Migration(migrations.Migration):
    dependencies = [("quor", "0004_file_store_identity")]

    operations = [
        migrations.AlterField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[
                    ("owner", "Owner"),
                    ("admin", "Admin"),
                    ("member", "Member"),
                    ("auditor", "Auditor (read-only)"),
                ],
                default="member",
                max_length=10,
            ),
        ),
        migrations.RunPython(make_first_admin_owner, owners_back_to_admins),
    ]

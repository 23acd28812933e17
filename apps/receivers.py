"""Any change to an App, a policy or a credential reaches the running proxies at once,
whichever path made it (services, the admin, a shell): a removed credential or a new
Deny must not wait for the proxies' periodic reload."""

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from approvals import wakeup
from apps.models import App, AppAction, AppCredential


def tell_the_proxies(**kwargs) -> None:
    transaction.on_commit(wakeup.publish_config_changed, robust=True)


def connect() -> None:
    for model in (App, AppAction, AppCredential):
        post_save.connect(tell_the_proxies, sender=model, dispatch_uid=f"proxies-{model.__name__}")
        post_delete.connect(
            tell_the_proxies, sender=model, dispatch_uid=f"proxies-del-{model.__name__}"
        )

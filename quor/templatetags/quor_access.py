"""What the signed-in user's role lets a page offer them."""

from django import template

from quor.admin_site import may_enter_admin_site

register = template.Library()


@register.filter
def may_enter_admin(user) -> bool:
    return may_enter_admin_site(user)

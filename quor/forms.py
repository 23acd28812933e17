import math

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from quor.lib.login_attempts import client_address, login_locked_for


class EmailAuthenticationForm(AuthenticationForm):
    username = forms.EmailField(
        label="Email", widget=forms.EmailInput(attrs={"autofocus": True, "autocomplete": "email"})
    )

    def clean(self):
        """A refused attempt of a locked account or address says so (the lockout is in
        the authentication backend, quor/lib/login_attempts.py); the same words whatever
        the password was."""
        try:
            return super().clean()
        except ValidationError:
            locked_for = login_locked_for(
                self.cleaned_data.get("username", ""), client_address(self.request)
            )
            if not locked_for:
                raise
            minutes = math.ceil(locked_for / 60)
            raise ValidationError(
                f"Too many failed login attempts. Try again in {minutes} "
                f"minute{'s' if minutes != 1 else ''}."
            ) from None

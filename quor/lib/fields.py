"""Encrypted model fields that depend on QUOR_ENCRYPTION_KEY alone.

django-cryptography encrypts with CRYPTOGRAPHY_KEY but, by default, signs the
ciphertext with SECRET_KEY: rotating SECRET_KEY would make every stored
credential unreadable. These fields sign with a key derived from the
encryption key instead (a test rotates SECRET_KEY to prove it). They are
classes of their own, so migrations (historical models) use them too.
"""

import hashlib
import hmac

import django_cryptography.conf  # noqa: F401  (derives settings.CRYPTOGRAPHY_KEY)
from django.conf import settings
from django.db import models
from django_cryptography.core.signing import FernetSigner
from django_cryptography.fields import EncryptedMixin
from django_cryptography.utils.crypto import FernetBytes


def _signing_key() -> bytes:
    return hmac.new(
        settings.CRYPTOGRAPHY_KEY, b"quor-encrypted-field-signing", hashlib.sha256
    ).digest()


class QuorEncryptedMixin(EncryptedMixin):
    wasinstance = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fernet = FernetBytes(signer=FernetSigner(key=_signing_key()))


class EncryptedTextField(QuorEncryptedMixin, models.TextField):
    base_class = models.TextField


class EncryptedCharField(QuorEncryptedMixin, models.CharField):
    base_class = models.CharField

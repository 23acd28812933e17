"""Encrypted model fields that depend on QUOR_ENCRYPTION_KEY alone.

django-cryptography encrypts with CRYPTOGRAPHY_KEY but, by default, signs the
ciphertext with SECRET_KEY: rotating SECRET_KEY would make every stored
credential unreadable. These fields sign with a key derived from the
encryption key instead (a test rotates SECRET_KEY to prove it).
"""

import hashlib
import hmac

import django_cryptography.conf  # noqa: F401  (derives settings.CRYPTOGRAPHY_KEY)
from django.conf import settings
from django_cryptography.core.signing import FernetSigner
from django_cryptography.fields import encrypt
from django_cryptography.utils.crypto import FernetBytes


def _signing_key() -> bytes:
    return hmac.new(
        settings.CRYPTOGRAPHY_KEY, b"quor-encrypted-field-signing", hashlib.sha256
    ).digest()


def encrypted(base_field):
    field = encrypt(base_field)
    field._fernet = FernetBytes(signer=FernetSigner(key=_signing_key()))
    return field

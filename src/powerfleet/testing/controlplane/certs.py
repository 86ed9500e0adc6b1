"""The control plane's keys and certificates, made in process as envtest makes them (its tinyca):
an ECDSA CA for 168 h, a serving certificate for localhost and 127.0.0.1, a client certificate for
the admin user in ``system:masters``, and a separate key pair that signs service-account tokens."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(hours=168)


@dataclass(frozen=True)
class Pki:
    """Paths of the files the API server, the controllers and the clients read."""

    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _cert(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          signer: ec.EllipticCurvePrivateKey, *, ca: bool, usage: list | None = None,
          sans: list | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + VALIDITY)
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False,
                                          encipher_only=False, decipher_only=False), critical=True)
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(signer, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("powerfleet-control-plane-ca")
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    serving_key = _key()
    serving = _cert(_name("kube-apiserver"), serving_key, ca_name, ca_key, ca=False,
                    usage=[ExtendedKeyUsageOID.SERVER_AUTH],
                    sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                          x509.IPAddress(ipaddress.ip_address("10.0.0.1"))])
    admin_key = _key()
    admin = _cert(_name("admin", "system:masters"), admin_key, ca_name, ca_key, ca=False,
                  usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    sa_key = _key()
    pki = Pki(*(directory / n for n in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "admin.crt",
                                        "admin.key", "sa.key", "sa.pub")))
    pem = serialization.Encoding.PEM
    pki.ca_crt.write_bytes(ca.public_bytes(pem))
    pki.ca_key.write_bytes(_pem_key(ca_key))
    pki.serving_crt.write_bytes(serving.public_bytes(pem))
    pki.serving_key.write_bytes(_pem_key(serving_key))
    pki.admin_crt.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(_pem_key(admin_key))
    pki.sa_key.write_bytes(_pem_key(sa_key))
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki

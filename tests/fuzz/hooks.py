"""Schemathesis hooks for `make fuzz-api`: who calls each operation.

Tokens come from the local stack's `POST /local/token` (its stand-in for the identity
provider), fetched once per role and cached: the admin's for `/admin/*`, an ordinary
buyer's for everything else, so buyer routes are fuzzed as a buyer, not as an admin.
"""

import os

import requests
import schemathesis

API_URL = os.environ["FLASHSALE_FUZZ_API_URL"]


def role_of(case):
    return "admin" if case.operation.path.startswith("/admin") else "buyer"


@schemathesis.auth(cache_by_key=lambda case, ctx: role_of(case))
class LocalToken:
    def get(self, case, ctx):
        admin = role_of(case) == "admin"
        response = requests.post(
            f"{API_URL}/local/token",
            json={"user_id": "fuzz-admin" if admin else "fuzz-buyer", "admin": admin},
            timeout=30,
        )
        response.raise_for_status()
        return response.json()["token"]

    def set(self, case, token, ctx):
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {token}"

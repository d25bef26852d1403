#!/usr/bin/env python3
"""Write units of the grab's take as a stock shard item fills, from DynamoDB's own count.

The take (functions/lib/adapters/src/dynamo/ledger.rs, `take`) names its order among the
shard's takers, so the item grows by one entry per unit held and an UpdateItem is billed
at the larger of its sizes before and after. This sends the adapter's own update and
condition (`TAKE_UPDATE` and `TAKE_CONDITION`, read from ledger.rs, so they cannot drift)
to an item shaped as `item::shard_item` makes it, with entries as `item::taker_value`
makes them (a 26-character order ULID under `takers`, a 36-character user id and a
millisecond timestamp), on DynamoDB Local with ReturnConsumedCapacity=TOTAL, once per
unit, and prints where the write units step up. `flashsale-load model`'s
`--taker-bytes` and `--shard-item-bytes` are fitted to these steps.

    python3 infra/bench/shard_item_wcu.py http://127.0.0.1:8000 [units]
"""

import random
import re
import string
import sys
import time
import uuid
from pathlib import Path

import boto3

ULID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


LEDGER = Path(__file__).resolve().parents[2] / "functions/lib/adapters/src/dynamo/ledger.rs"


def ledger_constant(name: str) -> str:
    """A `pub(super) const NAME: &str = "...";` of ledger.rs, joined if it spans lines."""
    found = re.search(rf'const {name}: &str =\s*"([^"]*)";', LEDGER.read_text())
    if not found:
        sys.exit(f"{name} not found in {LEDGER}")
    return found.group(1)


def ulid() -> str:
    return "".join(random.choice(ULID_ALPHABET) for _ in range(26))


def main() -> None:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
    units = int(sys.argv[2]) if len(sys.argv) > 2 else 250
    db = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    table = "shard-item-wcu-" + "".join(random.choices(string.ascii_lowercase, k=8))
    db.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
    )
    sale_id = "sale-" + ulid().lower()
    key = {"pk": {"S": f"SALE#{sale_id}#SHARD#1234"}, "sk": {"S": "STOCK"}}
    db.put_item(
        TableName=table,
        Item={
            **key,
            "available": {"N": str(units)},
            "total": {"N": str(units)},
            "takers": {"M": {}},
        },
    )
    consumed = []
    for _ in range(units):
        taker = {
            "M": {
                "u": {"S": str(uuid.uuid4())},
                "t": {"N": str(int(time.time() * 1000))},
            }
        }
        answer = db.update_item(
            TableName=table,
            Key=key,
            UpdateExpression=ledger_constant("TAKE_UPDATE"),
            ConditionExpression=ledger_constant("TAKE_CONDITION"),
            ExpressionAttributeNames={
                "#available": "available",
                "#takers": "takers",
                "#order": ulid(),
            },
            ExpressionAttributeValues={
                ":one": {"N": "1"},
                ":zero": {"N": "0"},
                ":taker": taker,
            },
            ReturnConsumedCapacity="TOTAL",
        )
        consumed.append(answer["ConsumedCapacity"]["CapacityUnits"])
    db.delete_table(TableName=table)
    steps = [take + 1 for take in range(1, units) if consumed[take] != consumed[take - 1]]
    print(f"takes: {units}; write units of the first {consumed[0]}, of the last {consumed[-1]}")
    print(f"mean write units per take: {sum(consumed) / units:.3f}")
    print(f"takes at which the write units step up: {steps}")


if __name__ == "__main__":
    main()

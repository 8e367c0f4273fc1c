"""dqa.regen: fleet, request client, durable journal and shards, planning, merge."""

"""dqa.expectations: Great Expectations suites (JSON files here), the validator and the release gate."""

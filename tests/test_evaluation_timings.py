"""``evaluation.timings.Timings``: how an evaluation run adds up the phase timings its parts return."""

from longrm_jax.evaluation.timings import Timings


def test_parts_add_up_by_kind():
    run = Timings({"load_s": 2.0})
    run.add({"prefill_s": 1.5, "decode_tokens": 10, "max_slots": 8, "slot_plan": {"2048": 8}})
    run.add(Timings({"prefill_s": 0.5, "decode_tokens": 5, "max_slots": 4, "slot_plan": {"4096": 2}}))
    assert run.as_dict() == {"load_s": 2.0, "prefill_s": 2.0, "decode_tokens": 15, "max_slots": 8,
                             "slot_plan": {"2048": 8, "4096": 2}}


def test_set_records_values_as_they_are_and_nested_records_as_dicts():
    run = Timings({"judging_s": 3.0}).set(total_s=4.0, long_timings=Timings({"prefill_s": 1.0}), device="H200")
    assert run.get("judging_s") == 3.0 and run.get("missing", 0) == 0
    assert run.as_dict() == {"judging_s": 3.0, "total_s": 4.0, "long_timings": {"prefill_s": 1.0}, "device": "H200"}
    copy = run.as_dict()
    copy["total_s"] = 0  # the record is not changed through what it returned
    assert run.get("total_s") == 4.0

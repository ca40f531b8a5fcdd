"""benchmarks/step_hlo.py: opcodes are counted for single-shape and tuple-shaped instructions
(custom calls return tuples), and copies and slices are listed."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import step_hlo  # noqa: E402

HLO = """ENTRY %main (p: s32[64]) -> (s32[32], f32[2]) {
  %a = s32[32]{0} slice(%p), slice={[0:32]}
  %ffi_call.78 = (f32[32,32,128]{2,1,0}, f32[320]{0}) custom-call(%x, %y), custom_call_target="t"
  %c = f32[8]{0} copy(%z)
  ROOT %t = (s32[1]{0}, /*index=5*/f32[2]{0}) tuple(%a, %c)
}"""


def test_counts_tuple_typed_instructions_and_lists_copies():
    opcodes, listed = step_hlo.summarize(HLO)
    assert opcodes == {"slice": 1, "custom-call": 1, "copy": 1, "tuple": 1}
    assert listed == ["%a = s32[32]{0} slice(%p), slice={[0:32]}", "%c = f32[8]{0} copy(%z)"]

"""benchmarks/sass_same.py: cuobjdump -sass parsed per kernel and two checkouts' kernels compared
instruction by instruction."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sass_same  # noqa: E402

DUMP = """
	code for sm_90a
		Function : _Z3fooILb1EEvv
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   EXIT ;                                  /* 0x000000000000794d */
		..........
		Function : _Z3barv
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   FADD R2, R2, R3 ;                       /* 0x0000000302027221 */
        /*0020*/                   EXIT ;                                  /* 0x000000000000794d */
"""


def test_kernels_lists_each_functions_instructions_in_order():
    got = sass_same.kernels(DUMP)
    foo = next(n for n in got if "foo" in n)
    bar = next(n for n in got if "bar" in n)
    assert got[foo] == ["LDC R1, c[0x0][0x28]", "EXIT"]
    assert got[bar] == ["MOV R1, c[0x0][0x28]", "FADD R2, R2, R3", "EXIT"]


def test_table_says_which_kernels_kept_their_sass():
    mine = {"void k<1>": ["A", "B"], "void k<2>": ["A", "C"], "void j": ["A"]}
    other = {"void k<1>": ["A", "B"], "void k<2>": ["A", "B"]}
    text = sass_same.table(mine, other, 0, "k<")
    assert "| void k<1> | 2 | 2 | yes |" in text
    assert "| void k<2> | 2 | 2 | no |" in text
    assert "void j" not in text
    assert "1 of 2 kernels have the same SASS" in text

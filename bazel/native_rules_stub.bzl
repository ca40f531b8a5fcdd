"""Offline stand-ins for @rules_cc and @rules_java.

Bazel 4's built-in @bazel_tools BUILD files load "@rules_cc//cc:defs.bzl" and
"@rules_java//java:defs.bzl", which the default WORKSPACE would download from GitHub. The
rules themselves are native in Bazel 4, so a repository whose defs.bzl forwards each name to
`native.<name>` is all those loads need, and nothing is fetched.
"""

_RULES = {
    "rules_cc": ("cc", [
        "cc_binary",
        "cc_import",
        "cc_library",
        "cc_proto_library",
        "cc_test",
        "cc_toolchain",
        "cc_toolchain_suite",
        "fdo_prefetch_hints",
        "fdo_profile",
        "objc_import",
        "objc_library",
    ]),
    "rules_java": ("java", [
        "java_binary",
        "java_import",
        "java_library",
        "java_lite_proto_library",
        "java_package_configuration",
        "java_plugin",
        "java_proto_library",
        "java_runtime",
        "java_test",
        "java_toolchain",
    ]),
}

def _native_rules_stub_impl(rctx):
    package, names = _RULES[rctx.name]
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", "")
    rctx.file(package + "/BUILD", "")
    rctx.file(package + "/defs.bzl", "".join([
        "def %s(**kwargs):\n    native.%s(**kwargs)\n\n" % (n, n)
        for n in names
    ]))

native_rules_stub = repository_rule(
    implementation = _native_rules_stub_impl,
    doc = "Generates @rules_cc or @rules_java (by name) as forwards to Bazel's native rules.",
)

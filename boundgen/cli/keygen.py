"""`boundgen keygen OUT`: an Ed25519 key pair for signed artifacts (OUT private, OUT.pub public)."""

from __future__ import annotations

from boundgen.cli.common import print_json


def register(sub):
    p = sub.add_parser("keygen", help="make an Ed25519 key pair to sign artifacts (build --sign-key, serve --trust-key)",
                       description="Write a new Ed25519 private key to OUT (PEM, mode 0600) and its public key to "
                                   "OUT.pub (PEM). Sign with `boundgen build ... --sign-key OUT`; serve with "
                                   "`boundgen serve ... --trust-key OUT.pub`. Equivalent: `openssl genpkey "
                                   "-algorithm ed25519 -out OUT` and `openssl pkey -in OUT -pubout -out OUT.pub`.")
    p.add_argument("out", metavar="OUT", help="private key file to write; the public key goes to OUT.pub")
    p.set_defaults(run=run)


def run(args):
    from boundgen.artifact.signing import generate_key

    private, public = generate_key(args.out)
    print_json({"private_key": str(private), "public_key": str(public)})

"""``nvidia-smi -L`` and ``--query-gpu=uuid,memory.total --format=csv,noheader,nounits`` for the rehearsal."""

import sys

from tests.gpufakes import H200_VM


def main(argv: list[str]) -> int:
    uuid = H200_VM.uuid(0)
    if argv == ["-L"]:
        print(f"GPU 0: {H200_VM.model} (UUID: {uuid})")
        return 0
    if argv and argv[0] == "--query-gpu=uuid,memory.total":
        print(f"{uuid}, {H200_VM.memory_mib}")
        return 0
    print(f"fake nvidia-smi: {argv} is not faked", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

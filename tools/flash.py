"""Flash mpllm onto an ESP32-S3 N16R8 (firmware + model image), or prepare the host board.

    python tools/flash.py --board n16r8 --port /dev/ttyACM0
    python tools/flash.py --board n16r8 --dry-run
    python tools/flash.py --board host

Thin wrapper around mpllm.board.flash; `--help` lists every option.
"""

if __name__ == "__main__":
    from _launch import launch

    launch("mpllm.board.flash:main", "flash.py")

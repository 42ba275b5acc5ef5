# Sourced by the shell tests: expect NAME COND prints a CMocka-style OK or FAILED line for the
# condition COND (a shell expression, evaluated) and sets fail=1 when it is false.
fail=0
expect() {
    if eval "$2"; then echo "[       OK ] $1"; else echo "[  FAILED  ] $1"; fail=1; fi
}

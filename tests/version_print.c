/* tests/version_print.c: prints kvvm_version() of the shared library it is linked to, for
   tests/version_agree.sh (a program, not ctypes: a sanitizer build's library loads only
   into a process that carries the sanitizer's runtime). */
#include <stdio.h>
#include "kvvm.h"

int main(void)
{
    return puts(kvvm_version()) < 0;
}

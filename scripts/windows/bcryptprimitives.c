/* A stand-in for Windows' bcryptprimitives.dll, for running dtlto-reapi.exe under wine 8.0, which
 * lacks it: Rust >= 1.78 programs take their random bytes from its ProcessPrng. This one asks
 * advapi32's RtlGenRandom (exported as SystemFunction036), which wine has. Not for Windows itself,
 * which has the real DLL. Built by scripts/build-windows.sh with mingw. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length) {
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}

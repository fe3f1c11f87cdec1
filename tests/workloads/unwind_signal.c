/* main raises SIGUSR1 over and over; the handler spins for a while, so most
 * samples are on a stack that goes handler_spin <- on_signal <- the kernel's
 * signal frame (__restore_rt) <- the interrupted raise() <- main.
 * Prints "ready" once running; runs until killed. */
#include <signal.h>
#include <stdio.h>

static volatile unsigned long sink;

#define NOINLINE __attribute__((noinline, noclone))

NOINLINE unsigned long handler_spin(unsigned long x) {
    for (int i = 0; i < 20000000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

NOINLINE void on_signal(int signal) {
    sink += handler_spin((unsigned long)signal);
    sink += 1;
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGUSR1, &action, NULL) != 0)
        return 1;
    printf("ready\n");
    fflush(stdout);
    for (;;)
        raise(SIGUSR1);
    return 0;
}

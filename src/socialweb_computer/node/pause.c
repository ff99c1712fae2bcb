/*
 * The pause container of socialweb-computer's pod sandboxes.
 *
 * A pod sandbox's first process holds the pod's namespaces open and, when the pod
 * shares its process namespace, is PID 1 for every container: it must reap orphans
 * and end on SIGTERM/SIGINT (exit 0) so StopPodSandbox is quick. It does nothing else.
 * Built statically by `python -m socialweb_computer.node.build` into the pause image.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void finish(int signo) {
    (void)signo;
    _exit(0);
}

static void reap(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_term = {.sa_handler = finish};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigaction(SIGTERM, &on_term, NULL);
    sigaction(SIGINT, &on_term, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;) {
        pause();
    }
    return 0;
}

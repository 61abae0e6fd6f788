# fish completion for fencerun

# True while the command line has no `--` yet (after it comes the command to run).
function __fencerun_before_dashdash
    not contains -- -- (commandline -opc)
end

# True when no subcommand or lock name has been given yet.
function __fencerun_needs_subcommand
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l skip 0
    for t in $tokens
        if test $skip -eq 1
            set skip 0
            continue
        end
        switch $t
            case -r --redis -t --ttl --renew --grace --kill-signal -w --wait -E --conflict-exit-code --lease-lost-exit-code --timeout --key-prefix --log-format
                set skip 1
            case '-*'
            case '*'
                return 1
        end
    end
    return 0
end

function __fencerun_using_status
    contains -- status (commandline -opc)
end

# After `--`: complete the command and its arguments.
function __fencerun_command_complete
    set -l tokens (commandline -opc)
    set -l i (contains -i -- -- $tokens)
    set -l rest $tokens[(math $i + 1)..-1] (commandline -ct)
    complete -C (string join -- ' ' (string escape -- $rest))
end

complete -c fencerun -f

complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_needs_subcommand' -a run -d 'Run COMMAND under a lock'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_needs_subcommand' -a status -d 'Show who holds a lock'

# Options of every form
complete -c fencerun -n __fencerun_before_dashdash -s r -l redis -x -a 'redis:// rediss:// unix://' -d 'Where the lock lives'
complete -c fencerun -n __fencerun_before_dashdash -l timeout -x -d 'Bound on any single Redis request'
complete -c fencerun -n __fencerun_before_dashdash -l key-prefix -x -d 'Prefix of every key fencerun writes'
complete -c fencerun -n __fencerun_before_dashdash -s v -l verbose -d 'More log output (repeat for debug)'
complete -c fencerun -n __fencerun_before_dashdash -s q -l quiet -d 'Log errors only'
complete -c fencerun -n __fencerun_before_dashdash -l log-format -x -a 'text json' -d 'Log line format'
complete -c fencerun -n __fencerun_before_dashdash -s h -l help -d 'Print help and exit'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_needs_subcommand' -l version -d 'Print the version and exit'

# Options of run (and of the form without a subcommand)
set -l run_cond '__fencerun_before_dashdash; and not __fencerun_using_status'
complete -c fencerun -n $run_cond -s t -l ttl -x -d 'Lease length'
complete -c fencerun -n $run_cond -l renew -x -d 'How often the lease is renewed'
complete -c fencerun -n $run_cond -l grace -x -d 'Time between the stop signal and SIGKILL'
complete -c fencerun -n $run_cond -l kill-signal -x -a 'HUP INT QUIT KILL TERM USR1 USR2 ALRM ABRT PIPE CONT STOP TSTP WINCH' -d 'First signal sent to the command'
complete -c fencerun -n $run_cond -s w -l wait -x -a '0 10s 1m 10m inf' -d 'How long to wait for a busy lock'
complete -c fencerun -n $run_cond -s E -l conflict-exit-code -x -d 'Exit code when the lock is busy'
complete -c fencerun -n $run_cond -l lease-lost-exit-code -x -d 'Exit code when the lease was lost'
complete -c fencerun -n $run_cond -l shell -d 'Run COMMAND through /bin/sh -c'

# Options of status
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using_status' -l json -d 'Print one JSON object'

# The command after `--`
complete -c fencerun -n 'not __fencerun_before_dashdash' -x -a '(__fencerun_command_complete)'

# fish completion for fencerun

# True while the command line has no `--` yet (after it comes the command to run).
function __fencerun_before_dashdash
    not contains -- -- (commandline -opc)
end

# The subcommand or lock NAME: the first word that is not an option or an option's value.
function __fencerun_first_word
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l skip 0
    for t in $tokens
        if test $skip -eq 1
            set skip 0
            continue
        end
        switch $t
            case --
                return 1
            case -r --server --redis -t --ttl --renew --grace --kill-signal -w --wait -E --conflict-exit-code --lease-lost-exit-code --timeout --key-prefix --log-format --metrics-file --min-replicas --replica-timeout --limit --tls-ca-file --tls-cert --tls-key --tls-server-name --owner --above --min-interval --every --slot-offset --if-record-lost --lock-delay --skip-exit-code --records-ttl --keep-runs -n --count
                set skip 1
            case '-*'
            case '*'
                echo $t
                return 0
        end
    end
    return 1
end

# True when no subcommand or lock name has been given yet.
function __fencerun_needs_subcommand
    not __fencerun_first_word >/dev/null
end

# True when the subcommand is $argv[1].
function __fencerun_using
    set -l w (__fencerun_first_word)
    test "$w" = $argv[1]
end

# True when the run options apply: no subcommand yet, `run`, or a lock NAME.
function __fencerun_run_form
    set -l w (__fencerun_first_word)
    not contains -- "$w" status list break bump history acl fence help
end

# True right after `help`: the subcommand whose help to show.
function __fencerun_help_needs_command
    set -l tokens (commandline -opc)
    test (count $tokens) -ge 2; and test "$tokens[-1]" = help; and __fencerun_using help
end

# fence: the guard given after `fence`, if any.
function __fencerun_fence_guard
    set -l tokens (commandline -opc)
    set -l i (contains -i -- fence $tokens)
    or return 1
    for t in $tokens[(math $i + 1)..-1]
        switch $t
            case --
                return 1
            case '-*'
            case '*'
                echo $t
                return 0
        end
    end
    return 1
end

function __fencerun_fence_needs_guard
    __fencerun_using fence; and not __fencerun_fence_guard >/dev/null
end

function __fencerun_fence_using
    __fencerun_using fence; or return 1
    set -l g (__fencerun_fence_guard)
    test "$g" = $argv[1]
end

# After `--`: complete the command and its arguments (not for `fence redis`, where a Redis
# command follows).
function __fencerun_command_complete
    __fencerun_using fence; and return
    set -l tokens (commandline -opc)
    set -l i (contains -i -- -- $tokens)
    set -l rest $tokens[(math $i + 1)..-1] (commandline -ct)
    complete -C (string join -- ' ' (string escape -- $rest))
end

complete -c fencerun -f

set -l needs_sub '__fencerun_before_dashdash; and __fencerun_needs_subcommand'
complete -c fencerun -n $needs_sub -a run -d 'Run COMMAND under a lock'
complete -c fencerun -n $needs_sub -a status -d 'Show who holds a lock'
complete -c fencerun -n $needs_sub -a history -d 'The recorded runs of a lock, newest first'
complete -c fencerun -n $needs_sub -a list -d 'List the locks that are held'
complete -c fencerun -n $needs_sub -a break -d "Release the lease of a lock's current holder"
complete -c fencerun -n $needs_sub -a bump -d "Raise a lock's token counter above a token"
complete -c fencerun -n $needs_sub -a acl -d 'Print the least-privilege Redis ACL rule'
complete -c fencerun -n $needs_sub -a fence -d 'Resource-side guards that reject stale tokens'
complete -c fencerun -n $needs_sub -a help -d 'Help of a subcommand'
complete -c fencerun -n __fencerun_help_needs_command -a 'run status list break bump history acl fence'

# Connection and logging options (run, status, list, break, bump)
set -l conn_cond '__fencerun_before_dashdash; and not __fencerun_using acl; and not __fencerun_using fence'
# A Redis server (Sentinel, a Cluster node) or an etcd cluster; 3, 5 or 7 times: quorum mode
complete -c fencerun -n $conn_cond -s r -l server -l redis -x -a 'redis:// rediss:// unix:// redis+sentinel:// rediss+sentinel:// etcd:// etcds://' -d 'Where the lock lives (3, 5 or 7 times: quorum mode)'
complete -c fencerun -n $conn_cond -l timeout -x -d 'Bound on any single Redis request'
complete -c fencerun -n $conn_cond -l key-prefix -x -d 'Prefix of every key fencerun writes'
complete -c fencerun -n $conn_cond -l tls-ca-file -r -F -d 'CA certificates to verify the server with'
complete -c fencerun -n $conn_cond -l tls-cert -r -F -d 'Client certificate (mutual TLS)'
complete -c fencerun -n $conn_cond -l tls-key -r -F -d 'Key of the client certificate'
complete -c fencerun -n $conn_cond -l tls-server-name -x -a '(__fish_print_hostnames)' -d 'Name to verify in the server certificate'
complete -c fencerun -n $conn_cond -l tls-insecure -d 'Do not verify the server certificate'
# Logging: every subcommand, every guard
complete -c fencerun -n __fencerun_before_dashdash -s v -l verbose -d 'More log output (repeat for debug)'
complete -c fencerun -n __fencerun_before_dashdash -s q -l quiet -d 'Log errors only'
complete -c fencerun -n __fencerun_before_dashdash -l log-format -x -a 'text json' -d 'Log line format'
complete -c fencerun -n '__fencerun_before_dashdash; and not __fencerun_using fence' -s h -l help -d 'Print help and exit'
complete -c fencerun -n $needs_sub -l version -d 'Print the version and exit'

# Options of run (and of the form without a subcommand)
set -l run_cond '__fencerun_before_dashdash; and __fencerun_run_form'
complete -c fencerun -n $run_cond -s t -l ttl -x -d 'Lease length'
complete -c fencerun -n $run_cond -l renew -x -d 'How often the lease is renewed'
complete -c fencerun -n $run_cond -l grace -x -d 'Time between the stop signal and SIGKILL'
complete -c fencerun -n $run_cond -l kill-signal -x -a 'HUP INT QUIT KILL TERM USR1 USR2 ALRM ABRT PIPE CONT STOP TSTP WINCH' -d 'First signal sent to the command'
complete -c fencerun -n $run_cond -s w -l wait -x -a '0 10s 1m 10m inf' -d 'How long to wait for a busy lock'
complete -c fencerun -n $run_cond -l fair -d 'Acquire in the order waiters began waiting'
complete -c fencerun -n $run_cond -l limit -x -a '1 2 3 4 8 16' -d 'Up to N holders at once, each in a slot (1 to 1024)'
complete -c fencerun -n $run_cond -s E -l conflict-exit-code -x -d 'Exit code when the lock is busy'
complete -c fencerun -n $run_cond -l lease-lost-exit-code -x -d 'Exit code when the lease was lost'
complete -c fencerun -n $run_cond -l min-interval -x -d 'Skip the run when the last success started less than DUR ago'
complete -c fencerun -n $run_cond -l lock-delay -x -d 'etcd: wait DUR after a holder vanished during its run'
complete -c fencerun -n $run_cond -l every -x -d 'Once per slot of DUR: skip when the slot already succeeded'
complete -c fencerun -n $run_cond -l slot-offset -x -d 'Slots of --every start DUR after each multiple of the period'
complete -c fencerun -n $run_cond -l if-record-lost -x -a 'run skip' -d 'When the record of runs is missing on the server'
complete -c fencerun -n $run_cond -l skip-exit-code -x -d 'Exit code when --every or --min-interval skips the run'
complete -c fencerun -n $run_cond -l records-ttl -x -d 'How long the record of runs is kept after the last run'
complete -c fencerun -n $run_cond -l keep-runs -x -d 'How many runs the record keeps (1 to 1000)'
complete -c fencerun -n $run_cond -l shell -d 'Run COMMAND through /bin/sh -c'
complete -c fencerun -n $run_cond -l metrics-file -r -F -d 'Write a Prometheus textfile after the run'
complete -c fencerun -n $run_cond -l min-replicas -x -d 'Replicas that must confirm the lock (WAIT)'
complete -c fencerun -n $run_cond -l replica-timeout -x -d 'How long to wait for those replicas'

# Options of status
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using status' -l json -d 'Print one JSON object'

# Options of list
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using list' -l all -d 'Also free locks that have issued tokens'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using list' -l json -d 'Print one JSON array'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using history' -l json -d 'Print one JSON array'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using history' -s n -l count -x -d 'Show the newest N runs'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using history' -l utc -d 'Times in UTC'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using history' -l all -d 'Also the skipped and busy triggers'

# Options of break
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using break' -l owner -x -d 'Only the holder whose owner id starts with PREFIX'
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using break' -s y -l yes -d 'Do not ask (required without a terminal)'

# Options of bump
complete -c fencerun -n '__fencerun_before_dashdash; and __fencerun_using bump' -l above -x -d 'Raise the counter so that the next token is greater than N'

# Options of acl
complete -c fencerun -n '__fencerun_using acl' -l key-prefix -x -d 'Prefix of the keys the rule allows'
complete -c fencerun -n '__fencerun_using acl' -l delex -d 'Also allow DELEX (Redis 8.4 and later)'
complete -c fencerun -n '__fencerun_using acl' -l delifeq -d 'Also allow DELIFEQ (Valkey 9.0 and later)'
complete -c fencerun -n '__fencerun_using acl' -l admin -d 'Also allow what list sends (SCAN)'

# fence file|redis|sql
complete -c fencerun -n __fencerun_fence_needs_guard -a file -d 'Replace a file from stdin, rejecting stale tokens'
complete -c fencerun -n __fencerun_fence_needs_guard -a redis -d 'Run a Redis command, rejecting stale tokens'
complete -c fencerun -n __fencerun_fence_needs_guard -a sql -d 'Print the schema of a SQL guard'
complete -c fencerun -n '__fencerun_fence_using file' -F
complete -c fencerun -n '__fencerun_fence_using file; or __fencerun_fence_using redis; and __fencerun_before_dashdash' -l token -x -d 'Fencing token (default: $FENCERUN_TOKEN)'
complete -c fencerun -n '__fencerun_fence_using file; and __fencerun_before_dashdash' -l read -d 'Admit the token and print the file (read-modify-write)'
set -l fence_redis '__fencerun_fence_using redis; and __fencerun_before_dashdash'
complete -c fencerun -n $fence_redis -s r -l server -l redis -x -a 'redis:// rediss:// unix:// redis+sentinel:// rediss+sentinel://' -d 'Where the fence key lives'
complete -c fencerun -n $fence_redis -l timeout -x -d 'Bound on connecting and on the request'
complete -c fencerun -n $fence_redis -l key-prefix -x -d 'Prefix of the fence key'
complete -c fencerun -n $fence_redis -l tls-ca-file -r -F -d 'CA certificates to verify the server with'
complete -c fencerun -n $fence_redis -l tls-cert -r -F -d 'Client certificate (mutual TLS)'
complete -c fencerun -n $fence_redis -l tls-key -r -F -d 'Key of the client certificate'
complete -c fencerun -n $fence_redis -l tls-server-name -x -a '(__fish_print_hostnames)' -d 'Name to verify in the server certificate'
complete -c fencerun -n $fence_redis -l tls-insecure -d 'Do not verify the server certificate'
complete -c fencerun -n $fence_redis -s v -l verbose -d 'More log output (repeat for debug)'
complete -c fencerun -n $fence_redis -s q -l quiet -d 'Log errors only'
complete -c fencerun -n $fence_redis -l log-format -x -a 'text json' -d 'Log line format'
complete -c fencerun -n $fence_redis -l resource -x -d 'Resource name (default: $FENCERUN_LOCK)'
complete -c fencerun -n '__fencerun_fence_using sql' -a postgresql -d 'PostgreSQL: table and fencerun_admit()'
complete -c fencerun -n '__fencerun_fence_using sql' -a postgres -d 'PostgreSQL (synonym of postgresql)'
complete -c fencerun -n '__fencerun_fence_using sql' -a mysql -d 'MariaDB/MySQL: table and procedure fencerun_admit()'
complete -c fencerun -n '__fencerun_fence_using sql' -a mariadb -d 'MariaDB/MySQL (synonym of mysql)'
complete -c fencerun -n '__fencerun_fence_using sql' -a sqlite -d 'SQLite: table, view fencerun_admit and its trigger'
complete -c fencerun -n '__fencerun_using fence; and __fencerun_before_dashdash' -s h -l help -d 'Print the help of fence or of the guard and exit'

# The command after `--`
complete -c fencerun -n 'not __fencerun_before_dashdash' -x -a '(__fencerun_command_complete)'

# gpubk login notice: written by `bk admin login-hook install` (or
# `bk admin install --login-hook`); `bk admin login-hook uninstall` removes it.
# Every login shell sources this file.  In an interactive login it prints
# what `bk login` has to say (notices, your bookings running now) once: the
# exported BK_LOGIN_SHOWN keeps nested login shells (su -, tmux) quiet.  It
# gives bk one second, throws away its errors, and prints nothing at all
# when there is nothing to say or bk is not there.
case $- in
    *i*)
        if [ -z "${BK_LOGIN_SHOWN-}" ] && [ -x @BK@ ]; then
            BK_LOGIN_SHOWN=1
            export BK_LOGIN_SHOWN
            if command -v timeout >/dev/null 2>&1; then
                timeout -k 1 1 @BK@ login 2>/dev/null </dev/null || :
            fi
        fi
        ;;
esac
